; What each import binds, one match per name: @source the module as written, @name the name
; taken from it, @alias the local name, @star a wildcard.
(import_statement name: (dotted_name) @source)
(import_statement name: (aliased_import name: (dotted_name) @source alias: (identifier) @alias))
(import_from_statement module_name: (_) @source name: (dotted_name) @name)
(import_from_statement module_name: (_) @source name: (aliased_import name: (dotted_name) @name alias: (identifier) @alias))
(import_from_statement module_name: (_) @source (wildcard_import) @star)
