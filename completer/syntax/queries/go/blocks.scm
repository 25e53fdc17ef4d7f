(source_file) @block
(block) @block
(statement_list) @block
