(comment) @comment
(interpreted_string_literal) @string
(raw_string_literal) @string
(rune_literal) @string
