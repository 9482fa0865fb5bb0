"""A message's kind is declared once, in its class header (records/codec.py `kind=`): it is
written first as "type", message_from_dict dispatches on it, and a record that is not a
message writes none."""

from p2ptrain.records.messages import (
    MESSAGE_TYPES,
    Heartbeat,
    LinkBytes,
    Stop,
    message_from_dict,
)


def test_the_wire_names_of_the_messages_stay() -> None:
    assert {name: kind.__name__ for name, kind in MESSAGE_TYPES.items()} == {
        "hello": "Hello",
        "metrics": "MetricsReport",
        "heartbeat": "Heartbeat",
        "compute": "ComputeReport",
        "saved": "SavedReport",
        "copies": "CopyReport",
        "session": "SessionReport",
        "start": "StartReport",
        "profile": "StepProfile",
        "plan": "PlanMessage",
        "run": "RunMessage",
        "stop": "Stop",
    }


def test_a_message_writes_its_kind_first_and_reads_back_by_it() -> None:
    for message in (Heartbeat("training", 3, 1, 2), Stop()):
        data = message.to_dict()
        assert next(iter(data)) == "type" and data["type"] == type(message).TYPE
        assert message_from_dict(data) == message
    assert Stop().to_dict() == {"type": "stop"}
    assert LinkBytes(1, 2).to_dict() == {"sent": 1, "received": 2}
