; Named definitions for the workspace index: @definition.<kind> is the node, @name its name,
; @body what a signature leaves out. Definitions inside a function body are dropped in code.
(function_item name: (identifier) @name body: (block) @body) @definition.function
(function_signature_item name: (identifier) @name) @definition.field
(struct_item name: (type_identifier) @name body: (_) @body) @definition.struct
(struct_item name: (type_identifier) @name !body) @definition.struct
(enum_item name: (type_identifier) @name body: (enum_variant_list) @body) @definition.enum
(trait_item name: (type_identifier) @name body: (declaration_list) @body) @definition.trait
(impl_item type: [(type_identifier) @name (generic_type type: (type_identifier) @name)]
           body: (declaration_list) @body) @definition.impl
(type_item name: (type_identifier) @name) @definition.type
(const_item name: (identifier) @name) @definition.variable
(static_item name: (identifier) @name) @definition.variable
(field_declaration name: (field_identifier) @name) @definition.field
(enum_variant name: (identifier) @name) @definition.field
