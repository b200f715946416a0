-- An account an administrator created or imported (POST /admin/users,
-- `latchkey users import`) holds somebody's credentials before its address
-- is verified: a registration of the address must not take it over, as it
-- may an unfinished sign-up. Set when the account is created or updated by
-- an import.
-- migrations/postgres/0008_imported.sql is the same in the other dialect.

ALTER TABLE users ADD COLUMN imported_at INTEGER;
