"""The base of every typed input read from YAML, JSON, the CLI or the Python API.

Frozen (an input never changes after it is validated), unknown keys rejected (a misspelt key is an error,
not a silently ignored setting), finite numbers only. A value of the wrong type is an error, not a guess: a YAML/JSON
``true`` where a number belongs (pydantic would read 1), a string there (``"8"``: a quoted number in a profile is a
typo or a template left unfilled), anything but true or false where a boolean belongs (``"no"``, ``0``).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from advisor.errors import AdvisorError, format_validation_error

# a profile's name, as output prints it and files carry it: one to 100 characters, none of them a control character
# (a newline or an escape sequence would forge lines of the output)
ProfileName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")]


def _members(annotation: Any) -> tuple[Any, Optional[list]]:
    """(the annotation without its constraints (Annotated[float, Field(ge=...)] is a float), the types a union or a
    tuple of it holds less None and ``...``, or None where it is neither)."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, tuple) or str(get_origin(annotation)) == "types.UnionType":
        return annotation, [a for a in get_args(annotation) if a is not type(None) and a is not Ellipsis]
    return annotation, None


def _numeric(annotation: Any) -> bool:
    """Whether a field takes numbers and not booleans (int, float, Optional or unions of them, tuples of them)."""
    annotation, args = _members(annotation)
    if annotation in (int, float):
        return True
    return bool(args) and bool not in args and any(_numeric(a) for a in args)


def _numbers_only(annotation: Any) -> bool:
    """Whether a field takes nothing but numbers (and None): a string there is the wrong type, not a spelling."""
    annotation, args = _members(annotation)
    if annotation in (int, float):
        return True
    return bool(args) and all(_numbers_only(a) for a in args)


def _bool_only(annotation: Any) -> bool:
    """Whether a field takes a boolean (or None) and nothing else: "no", "false" or 0 there is the wrong type."""
    annotation, args = _members(annotation)
    return annotation is bool or (get_origin(annotation) is not tuple and args == [bool])


class SpecError(AdvisorError):
    """A typed input built in Python that breaks a rule (``Plan(dp=0)``): one line naming the class and the field, with
    pydantic's ``errors()`` kept for the callers that name the field as their own input spells it (advisor.options)."""

    def __init__(self, kind: str, exc: ValidationError):
        super().__init__(f"{kind}: {format_validation_error(exc)}")
        self.validation = exc

    def errors(self) -> list:
        return self.validation.errors()


class Spec(BaseModel):
    """Base for every typed input: frozen, unknown keys rejected, finite numbers only."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v, info):
        """YAML/JSON ``true`` where a number belongs would silently become 1: refuse it."""
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(v, bool) and _numeric(annotation):
            raise ValueError(f"must be a number, not {str(v).lower()}")
        if v is not None and not isinstance(v, bool) and _bool_only(annotation):  # pydantic would read "no", "yes", 0, 1
            raise ValueError(f"must be true or false, not {v!r}")
        if isinstance(v, (str, bytes)) and _numbers_only(annotation):
            raise ValueError(f"must be a number, not the string {v!r} ({_bare_number(v, info.field_name)})")
        if isinstance(v, dict) and get_origin(annotation) is dict and _numbers_only(get_args(annotation)[1]):
            for key, val in v.items():
                if isinstance(val, bool):
                    raise ValueError(f"{key} must be a number, not {str(val).lower()}")
                if isinstance(val, str):
                    raise ValueError(f"{key} must be a number, not the string {val!r} "
                                     f"({_bare_number(val, info.field_name)})")
        return v


# the units the profiles' keys end in (memory_GiB, bandwidth_GBps, inter_node.bandwidth_Gbps, latency_us, peak_tflops)
UNITS = {"GiB": "GiB", "MiB": "MiB", "GBps": "GB/s", "Gbps": "Gb/s", "us": "microseconds", "ms": "milliseconds",
         "tflops": "TFLOP/s", "usd": "US dollars"}


def _bare_number(text: Any, key: Optional[str]) -> str:
    """How to write a quoted value as a number: a number in quotes without them; '400GB/s' as the number alone in the
    unit the key's name ends in (bandwidth_Gbps: Gb/s, so 400 GB/s is 3200), not "without quotes", which it is not."""
    try:
        float(text)
        return "write it without quotes"
    except (TypeError, ValueError):
        unit = UNITS.get((key or "").rpartition("_")[2])
        return f"write the number alone, in {unit} as the key's name says" if unit else "write the number alone"


class _OneLine(type(BaseModel)):  # pydantic's model metaclass
    """Calling the class (``Plan(dp=0)``) refuses a bad value as a SpecError. Only the call: an __init__ of its own
    would make pydantic validate nested and loaded models through it too (its custom_init), wrapping the error."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            raise SpecError(cls.__name__, exc) from None


class ApiSpec(Spec, metaclass=_OneLine):
    """A typed input users build in Python (advisor.Plan, TrainingSetup, ModelSpec): built with a bad value, a one-line
    SpecError (an AdvisorError, as the API's every other refusal), not pydantic's multi-line report. model_validate,
    which the loaders call, raises pydantic's ValidationError as before (their callers put it in one line)."""


def checked(obj: Any, error: type, what: str) -> Any:
    """``obj`` (a Spec handed to the API) validated again as if read from its file: the validated equal, or a one-line
    ``error`` naming ``what`` and the field where it breaks a rule. pydantic's model_copy(update=...) skips validation
    (an empty peak table hung the API, a zero bandwidth costed NaN), and a frozen model's nested dicts stay mutable: each
    call checks afresh (0.2 ms a profile or model, 1.5 ms a stack, against ~5 ms an estimate)."""
    import warnings

    from pydantic import ValidationError

    from advisor.errors import format_validation_error

    try:
        with warnings.catch_warnings():  # pydantic warns as it serialises the wrong type it is about to refuse
            warnings.simplefilter("ignore")
            data = obj.model_dump(exclude_none=True)  # Python objects: numpy scalars dump as they are
        return type(obj).model_validate(data)  # a value of the right type in the wrong form (a str for an enum) too
    except ValidationError as exc:
        raise error(f"{what}: {format_validation_error(exc)}") from None
