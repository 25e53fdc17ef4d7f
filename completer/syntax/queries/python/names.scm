; Names a next edit may rename (completer/edits/rename.py): @name a variable, parameter, function
; or class name; @member a name after a dot; @label a name that binds nothing (a keyword
; argument's); @scope.function / @scope.class where a @name / @member rename stays.
(identifier) @name
(attribute attribute: (identifier) @member)
(keyword_argument name: (identifier) @label)
[(function_definition) (lambda)] @scope.function
(class_definition) @scope.class
