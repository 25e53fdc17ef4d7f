; Named definitions for the workspace index: @definition.<kind> is the node, @name its name,
; @body what a signature leaves out. Definitions inside a function body are dropped in code.
(function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(generator_function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(class_declaration name: (identifier) @name body: (class_body) @body) @definition.class
(method_definition name: (_) @name body: (statement_block) @body) @definition.function
(field_definition property: (_) @name) @definition.field
(lexical_declaration
  (variable_declarator name: (identifier) @name
                       value: [(arrow_function body: (_) @body) (function_expression body: (statement_block) @body)])) @definition.function
(lexical_declaration (variable_declarator name: (identifier) @name)) @definition.variable
(variable_declaration (variable_declarator name: (identifier) @name)) @definition.variable
