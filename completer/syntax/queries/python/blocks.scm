; Containers of statements: a line whose first node is a direct child of one of these is a
; syntax boundary where a context window may start or end.
(module) @block
(block) @block
