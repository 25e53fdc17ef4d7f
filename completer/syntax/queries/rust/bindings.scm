; What `use` and `mod` bring into scope: @tree a use tree (flattened in code), @module a child
; module declared by `mod name;`.
(use_declaration argument: (_) @tree)
(mod_item name: (identifier) @module !body)
