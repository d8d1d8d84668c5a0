-- Running downgrade 20261205000020 -> 20261204000019

COMMIT;

ALTER TABLE messages DROP COLUMN IF EXISTS requested_input_json;

ALTER TABLE messages DROP COLUMN IF EXISTS function_response_json;

ALTER TABLE messages DROP COLUMN IF EXISTS more_requested_inputs_json;

ALTER TABLE messages DROP COLUMN IF EXISTS more_function_responses_json;

ALTER TABLE pending_inputs DROP COLUMN IF EXISTS response_schema_json;

ALTER TABLE pending_inputs DROP COLUMN IF EXISTS payload_json;

BEGIN;

UPDATE alembic_version SET version_num='20261204000019' WHERE alembic_version.version_num = '20261205000020';
