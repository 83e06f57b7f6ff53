-- Fleet.max_attempts is now Fleet.max_provision_attempts: how many provisions of one allocation may
-- fail before it is `failed`, apart from placement.max_claim_attempts (candidate nodes tried within
-- one placement after lost races). The column and its check follow the Fleet key; gpuaas_reschedule
-- takes the number as an argument and reads no column, so no function changes.

ALTER TABLE fleet_settings RENAME COLUMN max_attempts TO max_provision_attempts;
ALTER TABLE fleet_settings RENAME CONSTRAINT fleet_max_attempts TO fleet_max_provision_attempts;
