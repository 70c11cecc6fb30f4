"""List calls page through AIP-158 `page_token`/`next_page_token` once the protos have them: a real gRPC
server answers ListAvatars with a newer gateway's messages (built here), the client follows the pages."""

from __future__ import annotations

from concurrent import futures
from types import SimpleNamespace

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from lipline_client import LiplineClient

METHOD = "/lipline.v1.Gateway/ListAvatars"


def _newer_messages() -> tuple[type, type]:
    """A ListAvatars request and response with paging, in a pool of their own (as a newer gateway's protos)."""
    proto = descriptor_pb2.FileDescriptorProto(name="paging_test.proto", package="pagingtest", syntax="proto3")
    string, optional, repeated = (
        descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    request = proto.message_type.add(name="ListAvatarsRequest")
    request.field.add(name="filter", number=1, type=string, label=optional)
    request.field.add(name="page_token", number=2, type=string, label=optional)
    response = proto.message_type.add(name="ListAvatarsResponse")
    response.field.add(name="avatars", number=1, type=string, label=repeated)
    response.field.add(name="next_page_token", number=2, type=string, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("pagingtest.ListAvatarsRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("pagingtest.ListAvatarsResponse")),
    )


def test_a_list_follows_next_page_token_to_the_end_keeping_its_filters() -> None:
    Request, Response = _newer_messages()
    pages = {"": (["a", "b"], "p2"), "p2": (["c"], "p3"), "p3": (["d"], "")}
    seen: list[tuple[str, str]] = []

    def answer(request, context):
        seen.append((request.filter, request.page_token))
        items, following = pages[request.page_token]
        return Response(avatars=items, next_page_token=following)

    handler = grpc.method_handlers_generic_handler(
        "lipline.v1.Gateway",
        {
            "ListAvatars": grpc.unary_unary_rpc_method_handler(
                answer, request_deserializer=Request.FromString, response_serializer=Response.SerializeToString
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with LiplineClient(f"127.0.0.1:{port}", timeout=20) as client:
            client.stub = SimpleNamespace(  # the stub a newer gateway_pb2_grpc would make
                ListAvatars=client.channel.unary_unary(
                    METHOD, request_serializer=Request.SerializeToString, response_deserializer=Response.FromString
                )
            )
            items = list(client._pages("ListAvatars", Request(filter="label=x"), "avatars", None))
    finally:
        server.stop(0).wait()
    assert items == ["a", "b", "c", "d"]
    assert seen == [("label=x", ""), ("label=x", "p2"), ("label=x", "p3")]
