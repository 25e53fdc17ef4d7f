(function_declaration body: (statement_block) @body) @definition
(generator_function_declaration body: (statement_block) @body) @definition
(class_declaration body: (class_body) @body) @definition
(method_definition body: (statement_block) @body) @definition
(lexical_declaration
  (variable_declarator value: [(arrow_function body: (statement_block) @body)
                               (function_expression body: (statement_block) @body)])) @definition
