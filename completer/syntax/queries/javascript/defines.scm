; Definitions a next edit follows past the editable region (completer/edits/follow.py), as
; python/defines.scm: top-level functions, classes and variables, methods, parameters.
(program (function_declaration name: (identifier) @def.function))
(program (export_statement declaration: (function_declaration name: (identifier) @def.function)))
(program (class_declaration name: (identifier) @def.class))
(program (export_statement declaration: (class_declaration name: (identifier) @def.class)))
(program (lexical_declaration (variable_declarator name: (identifier) @def.variable)))
(program (export_statement declaration: (lexical_declaration (variable_declarator name: (identifier) @def.variable))))
(class_body (method_definition name: (property_identifier) @def.method))
(formal_parameters (identifier) @def.parameter)
(formal_parameters (assignment_pattern left: (identifier) @def.parameter))
