; Definitions a next edit follows past the editable region (completer/edits/follow.py), as
; python/defines.scm: top-level functions and types, methods, parameters.
(source_file (function_declaration name: (identifier) @def.function))
(source_file (method_declaration name: (field_identifier) @def.method))
(source_file (type_declaration (type_spec name: (type_identifier) @def.class)))
(source_file (var_declaration (var_spec name: (identifier) @def.variable)))
(source_file (const_declaration (const_spec name: (identifier) @def.variable)))
(parameter_declaration name: (identifier) @def.parameter)
