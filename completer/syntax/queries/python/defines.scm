; Definitions a next edit follows past the editable region (completer/edits/follow.py): a rename
; of one of these, or a change of its parameters, is carried to its uses in the file and in the
; workspace files that import it. @def.function, @def.class, @def.variable at module level;
; @def.method in a class body; @def.parameter a function's parameter.
(module (function_definition name: (identifier) @def.function))
(module (decorated_definition definition: (function_definition name: (identifier) @def.function)))
(module (class_definition name: (identifier) @def.class))
(module (decorated_definition definition: (class_definition name: (identifier) @def.class)))
(module (expression_statement (assignment left: (identifier) @def.variable)))
(class_definition body: (block (function_definition name: (identifier) @def.method)))
(class_definition body: (block (decorated_definition definition: (function_definition name: (identifier) @def.method))))
(parameters (identifier) @def.parameter)
(parameters (default_parameter name: (identifier) @def.parameter))
(parameters (typed_parameter (identifier) @def.parameter))
(parameters (typed_default_parameter name: (identifier) @def.parameter))
