; Names a next edit may rename (completer/edits/rename.py), as javascript/names.scm plus types.
[(identifier) (shorthand_property_identifier) (shorthand_property_identifier_pattern) (type_identifier)] @name
[(property_identifier) (private_property_identifier)] @member
[(function_declaration) (function_expression) (arrow_function) (method_definition)
 (generator_function_declaration)] @scope.function
[(class_declaration) (abstract_class_declaration) (class) (interface_declaration)] @scope.class
