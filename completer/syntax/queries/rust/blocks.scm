(source_file) @block
(block) @block
(declaration_list) @block
