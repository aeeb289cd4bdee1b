-- Conversations (/v1/conversations): the serialized tether.responses.v1.Conversation and its
-- ordered items, held by value (they are appended or deleted one by one, never shared).
CREATE TABLE conversations (
    tenant       text  NOT NULL,
    id           text  NOT NULL,
    conversation bytea NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE conversation_items (
    tenant          text    NOT NULL,
    conversation_id text    NOT NULL,
    position        bigint  NOT NULL,
    item_id         text    NOT NULL,
    item            bytea   NOT NULL,
    PRIMARY KEY (tenant, conversation_id, position)
);
