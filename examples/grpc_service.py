"""An internal service over gRPC: one long-lived Tether session, many concurrent requests, typed
answers. A ticket-triage service classifies support tickets with a JSON schema (structured output),
each ticket on its own lane of the one connection, and reads the typed `Response` protobuf back.

    tether serve &
    python examples/grpc_service.py [HOST:PORT]

Address: argv[1], else $TETHER_TARGET, else 127.0.0.1:50051; API key: $TETHER_API_KEY.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import tether.client

TRIAGE = {
    "type": "json_schema",
    "name": "triage",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "priority": {"type": "string", "enum": ["low", "normal", "urgent"]},
            "team": {"type": "string", "enum": ["billing", "platform", "support"]},
            "summary": {"type": "string"},
        },
        "required": ["priority", "team", "summary"],
        "additionalProperties": False,
    },
}


class TriageService:
    """What an internal service holds: one session (reconnects and retries are the client's), and
    a method its handlers call concurrently."""

    def __init__(self, session: tether.client.ClientSession, model: str = "tether-sim") -> None:
        self.session = session
        self.model = model

    async def triage(self, ticket_id: str, text: str) -> dict:
        lane = self.session.lane(ticket_id)  # each ticket on its own lane: they run side by side
        stream = await lane.create(
            self.model,
            text,
            instructions="Classify the support ticket.",
            text={"format": TRIAGE},
            store=False,
            metadata={"ticket": ticket_id},
        )
        response = await stream.final_response()  # a responses.v1.Response protobuf
        answer = response.output[-1].message.content[0].output_text.text
        return {"ticket": ticket_id, "status": response.status, **json.loads(answer),
                "tokens": response.usage.total_tokens}


async def main(target: str) -> None:
    tickets = {
        "T-1": "I was charged twice for the March invoice.",
        "T-2": "The API returns 502 for every request since this morning.",
        "T-3": "How do I change the e-mail address on my account?",
    }
    async with tether.client.connect(target, api_key=os.environ.get("TETHER_API_KEY")) as session:
        service = TriageService(session)
        results = await asyncio.gather(*(service.triage(tid, text) for tid, text in tickets.items()))
        for result in results:
            print(json.dumps(result, sort_keys=True))
        print(f"{len(results)} tickets over {session.connections_opened} connection(s)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TETHER_TARGET", "127.0.0.1:50051")))
