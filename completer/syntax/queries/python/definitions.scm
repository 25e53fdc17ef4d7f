; Definitions whose signature (text up to @body) stands in for the whole definition.
(function_definition body: (block) @body) @definition
(class_definition body: (block) @body) @definition
