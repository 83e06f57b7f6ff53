-- Webhook delivery (reconciler/service/webhooks.py): how far each webhook URL has delivered the outbox,
-- and the events it gave up on after its retries (for an operator to look at and replay).

CREATE TABLE portal_webhook_cursors (
    url        text PRIMARY KEY,
    last_id    bigint NOT NULL,     -- outbox id delivered (or dead-lettered) last
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE portal_webhook_dead_letters (
    id          bigserial PRIMARY KEY,
    url         text NOT NULL,
    outbox_id   bigint NOT NULL,
    attempts    integer NOT NULL,
    last_status integer,            -- NULL: no HTTP answer (refused, timed out)
    last_error  text NOT NULL,
    payload     jsonb NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);
