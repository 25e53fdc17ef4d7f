; What each import binds: @source the import path, @alias the local name when one is given
; (else the path's last element); @package the file's own package.
(import_spec !name path: (interpreted_string_literal (interpreted_string_literal_content) @source))
(import_spec name: (package_identifier) @alias path: (interpreted_string_literal (interpreted_string_literal_content) @source))
(package_clause (package_identifier) @package)
