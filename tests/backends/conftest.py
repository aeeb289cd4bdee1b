from tests.fakes import fake_chat_server  # noqa: F401  (the shared fixture)
