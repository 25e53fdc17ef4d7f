; Definitions a next edit follows past the editable region (completer/edits/follow.py), as
; javascript/defines.scm with TypeScript's parameters, classes and interfaces.
(program (function_declaration name: (identifier) @def.function))
(program (export_statement declaration: (function_declaration name: (identifier) @def.function)))
(program (class_declaration name: (type_identifier) @def.class))
(program (export_statement declaration: (class_declaration name: (type_identifier) @def.class)))
(program (interface_declaration name: (type_identifier) @def.class))
(program (export_statement declaration: (interface_declaration name: (type_identifier) @def.class)))
(program (lexical_declaration (variable_declarator name: (identifier) @def.variable)))
(program (export_statement declaration: (lexical_declaration (variable_declarator name: (identifier) @def.variable))))
(class_body (method_definition name: (property_identifier) @def.method))
(formal_parameters (required_parameter pattern: (identifier) @def.parameter))
(formal_parameters (optional_parameter pattern: (identifier) @def.parameter))
