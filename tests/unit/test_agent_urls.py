"""`klique agent --server` with replicas' URLs (broker/agents/http_link.py): a replica that
cannot be reached is passed over at once; a request that may have been applied is never sent
again, and the next one goes to the next replica."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from broker.agents.http_link import HttpLink, server_urls
from broker.errors import KliqueError, TransportError


def link_over(handler) -> HttpLink:  # noqa: ANN001
    link = HttpLink("http://a:1, http://b:2/", "token", "p")
    link.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return link


def test_a_replica_that_cannot_be_reached_is_passed_over_and_the_next_is_kept() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "a":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"estate": "pools: {}"})

    link = link_over(handler)
    assert asyncio.run(link.estate_text()) == "pools: {}"
    assert asyncio.run(link.estate_text()) == "pools: {}"
    assert asked == ["a", "b", "b"]


def test_a_request_that_may_have_been_applied_is_not_sent_again() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "a":
            raise httpx.ReadTimeout("no answer", request=request)
        return httpx.Response(200, json={"results": [True]})

    link = link_over(handler)
    with pytest.raises(TransportError):
        asyncio.run(link._calls([{"op": "submitted", "task_id": 1}]))
    assert asked == ["a"]
    assert asyncio.run(link._calls([{"op": "submitted", "task_id": 1}])) == [True]
    assert asked == ["a", "b"]


def test_server_urls_are_the_comma_separated_list_and_an_empty_one_is_refused() -> None:
    assert server_urls("https://k.example.org/") == ["https://k.example.org"]
    assert server_urls("http://a:1,http://b:2") == ["http://a:1", "http://b:2"]
    with pytest.raises(KliqueError, match="names no URL"):
        server_urls(" , ")
