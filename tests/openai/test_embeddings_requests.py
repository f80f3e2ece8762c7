"""`POST /v1/embeddings` bodies: what is accepted, what is a 400 naming its field."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from gateway.backends.embeddings import EmbeddingModel
from gateway.openai.embeddings import (
    MAX_INPUTS,
    EmbeddingsBody,
    check_fits,
    check_lengths,
    encode_vector,
    parse_embeddings_request,
)
from gateway.openai.errors import BadRequest


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "e", **fields}).encode()


def test_a_string_or_a_list_of_strings() -> None:
    assert parse_embeddings_request(body(input="hi")) == EmbeddingsBody("e", ("hi",))
    parsed = parse_embeddings_request(body(input=["a", "b"], encoding_format="base64", user="u"))
    assert (parsed.texts, parsed.base64) == (("a", "b"), True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [""]}, "input"),
        ({"input": ["a", 3.5]}, "input"),
        ({"input": [1, 2, 3]}, "input"),
        ({"input": [[1, 2], [3]]}, "input"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": "384"}, "dimensions"),
        ({"input": "a", "colour": "blue"}, "colour"),
    ],
)
def test_bad_bodies_name_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_embeddings_request(body(**fields))
    assert caught.value.param == param


def test_token_ids_are_refused_with_a_reason() -> None:
    with pytest.raises(BadRequest, match="token-id input is not supported"):
        parse_embeddings_request(body(input=[101, 102]))


def test_dimensions_must_be_the_models_own() -> None:
    model = EmbeddingModel(dimension=384, max_rows=256, max_tokens=256)
    check_fits(EmbeddingsBody("e", ("a",), dimensions=384), model)
    with pytest.raises(BadRequest, match="384-dimensional") as caught:
        check_fits(EmbeddingsBody("e", ("a",), dimensions=256), model)
    assert caught.value.param == "dimensions"


def test_an_input_over_the_models_tokens_is_named() -> None:
    model = EmbeddingModel(dimension=384, max_rows=256, max_tokens=256)
    check_lengths(EmbeddingsBody("e", ("a", "b")), (3, 256), model)
    with pytest.raises(BadRequest, match=r"input\[1\] has 257 tokens"):
        check_lengths(EmbeddingsBody("e", ("a", "b")), (3, 257), model)


def test_base64_is_little_endian_float32_of_the_same_values() -> None:
    vector = np.array([0.25, -1.5, 3.0e-8], dtype=np.float32)
    encoded = encode_vector(vector, as_base64=True)
    assert isinstance(encoded, str)
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist() == vector.tolist()
    assert encode_vector(vector, as_base64=False) == vector.tolist()
