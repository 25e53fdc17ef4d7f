; Names a next edit may rename (completer/edits/rename.py): @name a variable, parameter, function
; or class name; @member a property name; @scope.function / @scope.class where a @name / @member
; rename stays.
[(identifier) (shorthand_property_identifier) (shorthand_property_identifier_pattern)] @name
[(property_identifier) (private_property_identifier)] @member
[(function_declaration) (function_expression) (arrow_function) (method_definition)
 (generator_function_declaration)] @scope.function
[(class_declaration) (class)] @scope.class
