; Names a next edit may rename (completer/edits/rename.py): @name a variable, parameter, function
; or type name; @member a field or method name after a dot; @scope.function where a @name rename stays.
[(identifier) (type_identifier) (package_identifier)] @name
(field_identifier) @member
[(function_declaration) (method_declaration) (func_literal)] @scope.function
