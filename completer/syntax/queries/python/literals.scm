; Where completion is gated off (unless configured): comments, strings, docstrings.
(comment) @comment
(string) @string
(concatenated_string) @string
(module . (expression_statement (string) @docstring))
(function_definition body: (block . (expression_statement (string) @docstring)))
(class_definition body: (block . (expression_statement (string) @docstring)))
