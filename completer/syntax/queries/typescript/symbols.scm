; Named definitions for the workspace index: @definition.<kind> is the node, @name its name,
; @body what a signature leaves out. Definitions inside a function body are dropped in code.
(function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(generator_function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(class_declaration name: (_) @name body: (class_body) @body) @definition.class
(abstract_class_declaration name: (_) @name body: (class_body) @body) @definition.class
(method_definition name: (_) @name body: (statement_block) @body) @definition.function
(public_field_definition name: (_) @name) @definition.field
(abstract_method_signature name: (_) @name) @definition.field
(interface_declaration name: (_) @name body: (interface_body) @body) @definition.interface
(property_signature name: (_) @name) @definition.field
(method_signature name: (_) @name) @definition.field
(enum_declaration name: (_) @name body: (enum_body) @body) @definition.enum
(type_alias_declaration name: (_) @name) @definition.type
(lexical_declaration
  (variable_declarator name: (identifier) @name
                       value: [(arrow_function body: (_) @body) (function_expression body: (statement_block) @body)])) @definition.function
(lexical_declaration (variable_declarator name: (identifier) @name)) @definition.variable
(variable_declaration (variable_declarator name: (identifier) @name)) @definition.variable
