"""The token routes' bodies: llama.cpp's /tokenize and /detokenize (vLLM's /tokenize body
too), TabbyAPI's /v1/token/encode and /decode and text-generation-webui's
/v1/internal/encode, /decode and /token-count (routes/tokenize.py, routes/dialects.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TokenizeRequest(BaseModel):
    """llama.cpp's `{"content"}`, or vLLM's `{"model", "prompt"}` (`content` wins if both
    are sent; `model` is not checked)."""

    model_config = ConfigDict(extra="ignore")

    content: str | None = None
    prompt: str | None = Field(None, description="vLLM's name for content")
    model: str | None = None
    add_special: bool | None = Field(
        None,
        description="add the BOS token the model wants, if any (default: no; with vLLM's"
        " `prompt`, yes)",
    )
    add_special_tokens: bool | None = Field(None, description="vLLM's name for add_special")
    parse_special: bool = Field(True, description="read `<start_of_turn>` etc. as one token")
    with_pieces: bool = Field(False, description="return each token's text beside its id")

    @model_validator(mode="after")
    def _has_text(self) -> TokenizeRequest:
        if self.content is None and self.prompt is None:
            raise ValueError("send the text to tokenize as `content` (or vLLM's `prompt`)")
        return self

    @property
    def text(self) -> str:
        return self.content if self.content is not None else self.prompt or ""

    @property
    def bos(self) -> bool:
        for given in (self.add_special, self.add_special_tokens):
            if given is not None:
                return given
        return self.content is None  # vLLM adds special tokens by default


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]  # the text, or the bytes when they are not valid UTF-8 alone


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]
    count: int  # vLLM's
    max_model_len: int  # vLLM's: the context size


class DetokenizeRequest(BaseModel):
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    content: str


class EncodeRequest(BaseModel):
    """TabbyAPI's (`text`) or text-generation-webui's encode body; Aphrodite's `prompt`."""

    model_config = ConfigDict(extra="ignore")

    text: str | None = None
    prompt: str | None = Field(None, description="Aphrodite's name for text")
    add_bos_token: bool = Field(True, description="add the model's BOS token, if it wants one")
    encode_special_tokens: bool = Field(True, description="read `<start_of_turn>` as one token")

    @model_validator(mode="after")
    def _has_text(self) -> EncodeRequest:
        if self.text is None and self.prompt is None:
            raise ValueError("send the text to encode as `text`")
        return self

    @property
    def content(self) -> str:
        return self.text if self.text is not None else self.prompt or ""


class EncodeResponse(BaseModel):
    tokens: list[int]
    length: int


class TokenCount(BaseModel):
    length: int


class DecodeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int]


class DecodeResponse(BaseModel):
    text: str
