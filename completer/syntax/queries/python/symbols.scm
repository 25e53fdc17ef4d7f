; Named definitions for the workspace index: @definition.<kind> is the node, @name its name,
; @body what a signature leaves out. Definitions inside a function body are dropped in code.
(function_definition name: (identifier) @name body: (block) @body) @definition.function
(class_definition name: (identifier) @name body: (block) @body) @definition.class
(module (expression_statement (assignment left: (identifier) @name)) @definition.variable)
(class_definition body: (block (expression_statement (assignment left: (identifier) @name)) @definition.field))
