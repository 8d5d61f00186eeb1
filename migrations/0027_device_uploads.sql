-- Devices that train too (docs/delivery.md#devices-that-train-too): a model accepts its users' devices'
-- uploads only once an operator enables them (`attune model uploads`), with the largest change (L2 norm of the
-- device's parameters minus its parent's) one upload may make, and how many versions behind the head a change
-- the server applies for the device (If-Match: *) may be. NULL max norm: uploads are off.
ALTER TABLE attune_model_settings
    ADD COLUMN IF NOT EXISTS upload_max_change_norm double precision
        CHECK (upload_max_change_norm > 0 AND upload_max_change_norm < 'infinity'),
    ADD COLUMN IF NOT EXISTS upload_max_stale_versions integer NOT NULL DEFAULT 8
        CHECK (upload_max_stale_versions >= 0);
