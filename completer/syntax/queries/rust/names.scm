; Names a next edit may rename (completer/edits/rename.py): @name a variable, parameter, function
; or type name; @member a field or method name; @scope.function / @scope.class where a @name /
; @member rename stays.
[(identifier) (type_identifier) (shorthand_field_identifier)] @name
(field_identifier) @member
[(function_item) (closure_expression)] @scope.function
[(impl_item) (struct_item) (trait_item)] @scope.class
