(function_item body: (block) @body) @definition
(impl_item body: (declaration_list) @body) @definition
(trait_item body: (declaration_list) @body) @definition
(mod_item body: (declaration_list) @body) @definition
(struct_item body: (field_declaration_list) @body) @definition
(enum_item body: (enum_variant_list) @body) @definition
