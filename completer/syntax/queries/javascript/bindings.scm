; What each import binds, one match per name: @source the module specifier, @name the name taken
; from it ("default" for a default import), @alias the local name, @star everything;
; @export marks a re-export (`export ... from`).
(import_statement (import_clause (identifier) @alias) source: (string (string_fragment) @source))
(import_statement (import_clause (named_imports (import_specifier name: (_) @name !alias)))
                  source: (string (string_fragment) @source))
(import_statement (import_clause (named_imports (import_specifier name: (_) @name alias: (_) @alias)))
                  source: (string (string_fragment) @source))
(import_statement (import_clause (namespace_import (identifier) @alias)) source: (string (string_fragment) @source))
(export_statement (export_clause (export_specifier name: (_) @name !alias)) source: (string (string_fragment) @source)) @export
(export_statement (export_clause (export_specifier name: (_) @name alias: (_) @alias))
                  source: (string (string_fragment) @source)) @export
(export_statement (namespace_export (identifier) @alias) source: (string (string_fragment) @source)) @export
(export_statement "*" @star source: (string (string_fragment) @source)) @export
(variable_declarator name: (identifier) @alias
  value: (call_expression function: (identifier) @_fn arguments: (arguments . (string (string_fragment) @source)))
  (#eq? @_fn "require"))
(variable_declarator name: (object_pattern (shorthand_property_identifier_pattern) @name)
  value: (call_expression function: (identifier) @_fn arguments: (arguments . (string (string_fragment) @source)))
  (#eq? @_fn "require"))
