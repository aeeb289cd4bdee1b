-- Tether response store, version 2: the backend-pool replica that served each response, so
-- chain-affine routing finds a parent's replica after a reconnect or on another Tether replica.
ALTER TABLE responses ADD COLUMN replica text NOT NULL DEFAULT '';
