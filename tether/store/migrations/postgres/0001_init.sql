-- Tether response store, version 1. Forward-only: never edit a shipped migration, add 0002_....
-- Tables are created in the schema first on the connection's search_path.

-- Each item once per tenant: the serialized tether.responses.v1.Item and its API-visible id.
CREATE TABLE items (
    tenant  text  NOT NULL,
    key     text  NOT NULL,
    item_id text  NOT NULL DEFAULT '',
    item    bytea NOT NULL,
    PRIMARY KEY (tenant, key)
);

-- The final tether.responses.v1.Response of each store=true response.
CREATE TABLE responses (
    tenant              text        NOT NULL,
    id                  text        NOT NULL,
    response            bytea       NOT NULL,
    created_at          bigint      NOT NULL DEFAULT 0,
    conversation_tokens bigint      NOT NULL DEFAULT 0,
    stored_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);

-- The ordered key lists of each response: kind 0 = whole effective input, 1 = output.
CREATE TABLE response_items (
    tenant      text     NOT NULL,
    response_id text     NOT NULL,
    kind        smallint NOT NULL,
    position    integer  NOT NULL,
    item_key    text     NOT NULL,
    PRIMARY KEY (tenant, response_id, kind, position)
);
-- "Does any response still reference this item?" (deletion).
CREATE INDEX response_items_by_key ON response_items (tenant, item_key);

-- The usage ledger: exactly one line per completed response.
CREATE TABLE usage (
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    tenant           text   NOT NULL,
    response_id      text   NOT NULL,
    model            text   NOT NULL,
    backend          text   NOT NULL,
    input_tokens     bigint NOT NULL,
    cached_tokens    bigint NOT NULL,
    output_tokens    bigint NOT NULL,
    reasoning_tokens bigint NOT NULL,
    status           text   NOT NULL,
    created_at       double precision NOT NULL,
    PRIMARY KEY (tenant, response_id)
);
CREATE INDEX usage_by_seq ON usage (seq);
