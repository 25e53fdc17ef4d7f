; Definitions a next edit follows past the editable region (completer/edits/follow.py), as
; python/defines.scm: top-level functions, structs, enums and traits, methods, parameters.
(source_file (function_item name: (identifier) @def.function))
(source_file (struct_item name: (type_identifier) @def.class))
(source_file (enum_item name: (type_identifier) @def.class))
(source_file (trait_item name: (type_identifier) @def.class))
(source_file (const_item name: (identifier) @def.variable))
(source_file (static_item name: (identifier) @def.variable))
(impl_item body: (declaration_list (function_item name: (identifier) @def.method)))
(parameter pattern: (identifier) @def.parameter)
