(package_clause) @import
(import_declaration) @import
