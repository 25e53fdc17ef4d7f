(program) @block
(statement_block) @block
(class_body) @block
(switch_body) @block
(interface_body) @block
