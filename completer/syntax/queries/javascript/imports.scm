(import_statement) @import
(lexical_declaration
  (variable_declarator value: (call_expression function: (identifier) @_fn (#eq? @_fn "require")))) @import
(variable_declaration
  (variable_declarator value: (call_expression function: (identifier) @_fn (#eq? @_fn "require")))) @import
