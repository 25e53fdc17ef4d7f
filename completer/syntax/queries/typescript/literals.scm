(comment) @comment
(string) @string
(template_string) @string
(regex) @string
