; Named definitions for the workspace index: @definition.<kind> is the node, @name its name,
; @body what a signature leaves out, @receiver the type a method belongs to.
(function_declaration name: (identifier) @name body: (block) @body) @definition.function
(method_declaration
  receiver: (parameter_list (parameter_declaration type: [(type_identifier) @receiver
                                                          (pointer_type (type_identifier) @receiver)
                                                          (generic_type type: (type_identifier) @receiver)
                                                          (pointer_type (generic_type type: (type_identifier) @receiver))]))
  name: (field_identifier) @name body: (block) @body) @definition.function
(type_declaration (type_spec name: (type_identifier) @name type: (struct_type (field_declaration_list) @body))) @definition.struct
(type_declaration (type_spec name: (type_identifier) @name type: (interface_type) @body)) @definition.interface
(type_declaration (type_spec name: (type_identifier) @name)) @definition.type
(type_declaration (type_alias name: (type_identifier) @name)) @definition.type
(field_declaration name: (field_identifier) @name) @definition.field
(method_elem name: (field_identifier) @name) @definition.field
(const_declaration (const_spec name: (identifier) @name)) @definition.variable
(var_declaration (var_spec name: (identifier) @name)) @definition.variable
