; Statements that bring names into the module: kept in the prompt header when they fall
; outside the prefix window.
(import_statement) @import
(import_from_statement) @import
(future_import_statement) @import
