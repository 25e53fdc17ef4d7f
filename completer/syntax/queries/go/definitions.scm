(function_declaration body: (block) @body) @definition
(method_declaration body: (block) @body) @definition
(type_declaration (type_spec type: [(struct_type (field_declaration_list) @body)
                                    (interface_type) @body])) @definition
