"""Reading and replacing the input and target of every kind of batch container."""

from collections import OrderedDict
from dataclasses import dataclass

import pytest
import torch

from lightning_speedups import BatchFieldError, BatchFields
from tests.helpers import Pair, Sample

X, Y = torch.zeros(2, 3), torch.tensor([0, 1])


@dataclass(frozen=True)
class FrozenSample:
    image: torch.Tensor
    label: torch.Tensor


NEW_X, NEW_Y = torch.ones(2, 3), torch.tensor([[0.5, 0.5], [0.5, 0.5]])


class TaggedList(list):
    """A list subclass with an attribute, as some collate functions return."""

    tag = "class default"


def tagged(*items):
    out = TaggedList(items)
    out.tag = "mine"
    return out


@pytest.mark.parametrize(
    ("batch", "fields"),
    [
        ([X, Y], BatchFields()),
        ((X, Y), BatchFields()),
        ({"image": X, "label": Y, "meta": "m"}, BatchFields()),
        (OrderedDict(x=X, y=Y), BatchFields()),
        ({"pixels": X, "cls": Y}, BatchFields("pixels", "cls")),
        ([Y, X], BatchFields(input_key=1, target_key=0)),
        (Pair(X, Y), BatchFields()),
        (Pair(X, Y), BatchFields("image", "label")),
        (Sample(X, Y), BatchFields()),
        (FrozenSample(X, Y), BatchFields()),
        (tagged(X, Y), BatchFields()),
    ],
)
def test_get_and_replace_keep_the_container_and_leave_the_original(batch, fields):
    x, y = fields.get(batch)
    assert x is X and y is Y
    new = fields.replace(batch, input=NEW_X, target=NEW_Y)
    assert type(new) is type(batch)
    assert fields.get_input(new) is NEW_X and fields.get_target(new) is NEW_Y
    assert fields.get_input(batch) is X  # the original batch is untouched
    if isinstance(batch, dict):
        assert set(new) == set(batch)
    if isinstance(batch, TaggedList):
        assert new.tag == "mine"


def test_replace_only_the_target():
    batch = {"image": X, "label": Y}
    new = BatchFields().replace(batch, target=NEW_Y)
    assert new["image"] is X and new["label"] is NEW_Y


def test_custom_object_through_getter_and_setter():
    class Custom:
        def __init__(self, pixels, classes):
            self.pixels, self.classes = pixels, classes

    fields = BatchFields(getter=lambda b: (b.pixels, b.classes), setter=lambda b, x, y: Custom(x, y))
    batch = Custom(X, Y)
    new = fields.replace(batch, input=NEW_X)
    assert new.pixels is NEW_X and new.classes is Y and batch.pixels is X


def test_a_getter_may_return_a_collated_list_pair_and_must_return_a_pair():
    """Default collation gives ``[x, y]``: a getter that hands on one loader's batch of several returns a list."""
    fields = BatchFields(getter=lambda b: b["a"], setter=lambda b, x, y: {**b, "a": [x, y]})
    batch = {"a": [X, Y], "b": [X, Y]}
    x, y = fields.get(batch)
    assert x is X and y is Y
    assert fields.replace(batch, input=NEW_X)["a"][0] is NEW_X
    with pytest.raises(BatchFieldError, match=r"must return a pair \(input, target\).*got a list of 3"):
        BatchFields(getter=lambda b: [X, Y, Y], setter=lambda b, x, y: b).get(batch)
    with pytest.raises(BatchFieldError, match="got a Tensor"):
        BatchFields(getter=lambda b: X, setter=lambda b, x, y: b).get(batch)


def test_plain_object_attributes():
    class Obj:
        def __init__(self):
            self.image, self.label = X, Y

    new = BatchFields().replace(Obj(), input=NEW_X)
    assert new.image is NEW_X


def test_missing_key_error_names_the_key_and_what_exists():
    with pytest.raises(BatchFieldError, match=r"no input at 'img'.*\['image', 'label'\].*input_key"):
        BatchFields(input_key="img").get_input({"image": X, "label": Y})
    with pytest.raises(BatchFieldError, match="Pass `input_key=`"):
        BatchFields().get_input({"a": X, "b": Y})
    with pytest.raises(BatchFieldError, match="no target at 5"):
        BatchFields(target_key=5).get_target([X, Y])


def test_frozen_custom_object_without_setter_is_a_clear_error():
    class Frozen:
        __slots__ = ("image", "label")

        def __init__(self):
            object.__setattr__(self, "image", X)
            object.__setattr__(self, "label", Y)

        def __setattr__(self, k, v):
            raise AttributeError("frozen")

    fields = BatchFields("image", "label")
    with pytest.raises(BatchFieldError, match="getter`/`setter"):
        fields.replace(Frozen(), input=NEW_X)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"getter": lambda b: b}, "go together"),
        ({"input_key": 0, "getter": lambda b: b, "setter": lambda b, x, y: b}, "not both"),
        ({"input_key": 1.5}, "int index or a str key"),
        ({"input_key": "x", "target_key": "x"}, "must differ"),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        BatchFields(**kwargs)


def test_batch_without_target_gives_none():
    assert BatchFields().get_target([X]) is None
    assert BatchFields().get_target({"image": X}) is None


def test_key_of_names_where_input_and_target_are_read():
    batch = {"image": X, "y": Y}
    assert BatchFields().key_of(batch, "input") == "image"
    assert BatchFields().key_of(batch, "target") == "y"
    assert BatchFields().key_of([X, Y], "target") == 1
    assert BatchFields(target_key="label").key_of(batch, "target") == "label"  # the given key, as is
    with pytest.raises(BatchFieldError, match="Could not find the target"):
        BatchFields().key_of({"image": X}, "target")
    with pytest.raises(ValueError, match="getter"):
        BatchFields(getter=lambda b: b, setter=lambda b, x, y: b).key_of(batch, "input")


@pytest.mark.parametrize(
    ("fields", "batch"),
    [
        (BatchFields(input_key=1), [torch.tensor([0, 1]), torch.zeros(2, 3)]),  # default target index: 1 too
        (BatchFields(input_key=-1), [torch.zeros(2, 3), torch.tensor([0, 1])]),  # -1 is index 1 here
        (BatchFields(target_key="x"), {"x": torch.zeros(2, 3), "y": torch.tensor([0, 1])}),  # default input "x"
    ],
)
def test_input_and_target_at_the_same_place_is_an_error_not_one_tensor_read_twice(fields, batch):
    with pytest.raises(BatchFieldError, match=r"both read from .*Pass both `input_key=` and `target_key=`"):
        fields.get(batch)
    with pytest.raises(BatchFieldError, match="both read from"):
        fields.replace(batch, input=torch.ones(2, 3), target=torch.ones(2, 2))


def test_dataclass_batch_keeps_init_false_fields_and_later_attributes():
    from dataclasses import field

    @dataclass(frozen=True)
    class Tagged:
        x: torch.Tensor
        y: torch.Tensor
        ids: list = field(init=False, default_factory=list)

    batch = Tagged(torch.zeros(2, 3), torch.tensor([0, 1]))
    object.__setattr__(batch, "ids", [7, 8])
    object.__setattr__(batch, "source", "shard-3")  # set after construction
    new = BatchFields().replace(batch, input=torch.ones(2, 3))
    assert type(new) is Tagged and new.ids == [7, 8] and new.source == "shard-3"
    assert new.x.sum() == 6 and batch.x.sum() == 0 and new.y is batch.y  # the original untouched


def test_namedtuple_input_key_at_the_default_targets_field_is_an_error():
    from collections import namedtuple

    P = namedtuple("P", ["x", "y"])
    with pytest.raises(BatchFieldError, match="both read from"):
        BatchFields(input_key=1).get(P(torch.zeros(2, 3), torch.tensor([0, 1])))


def test_a_dataclass_with_post_init_is_built_anew_so_derived_fields_follow():
    from dataclasses import field

    @dataclass
    class Derived:
        image: torch.Tensor
        label: torch.Tensor
        height: int = field(init=False)

        def __post_init__(self):
            self.height = int(self.image.shape[-1])

    new = BatchFields().replace(Derived(torch.zeros(2, 3, 8, 8), torch.tensor([0, 1])), input=torch.zeros(2, 3, 4, 4))
    assert new.height == 4


def test_two_conventional_names_for_one_field_are_an_error_naming_both():
    with pytest.raises(BatchFieldError, match=r"several fields that could be the input: 'x', 'image'.*input_key="):
        BatchFields().get_input({"x": X, "image": X, "label": Y})
    # a second candidate target is not "no target" (which would give None and train on the hard labels)
    with pytest.raises(BatchFieldError, match=r"could be the target: 'label', 'labels'.*target_key="):
        BatchFields().get_target({"image": X, "label": Y, "labels": Y})
    both = {"x": X, "image": NEW_X, "label": Y, "labels": Y}
    x, y = BatchFields(input_key="image", target_key="label").get(both)
    assert x is NEW_X and y is Y
    assert BatchFields().get_target({"image": X}) is None  # no conventional target name at all: none
    # a named target beside two candidate inputs: the input is not read, so nothing to refuse (unless the
    # target is one of them)
    assert BatchFields(target_key="label").get_target({"x": X, "image": X, "label": Y}) is Y
    with pytest.raises(BatchFieldError, match=r"both read from 'x'"):
        BatchFields(target_key="x").get_target({"x": X, "image": X, "label": Y})


def test_a_dataclass_that_cannot_be_rebuilt_points_to_getter_and_setter():
    from dataclasses import InitVar

    @dataclass
    class Scaled:
        image: torch.Tensor
        label: torch.Tensor
        scale: InitVar[float]  # no default: dataclasses.replace cannot carry it over

        def __post_init__(self, scale):
            self.factor = scale

    with pytest.raises(BatchFieldError, match=r"Cannot rebuild the Scaled batch.*InitVar 'scale'.*batch_getter"):
        BatchFields().replace(Scaled(X, Y, 2.0), input=NEW_X)

    @dataclass
    class Checked:
        image: torch.Tensor
        label: torch.Tensor

        def __post_init__(self):
            if self.image.shape[-1] != 3:
                raise ValueError("image must be 3 wide")

    # the batch's own check keeps its own message and type
    with pytest.raises(ValueError, match=r"^image must be 3 wide$"):
        BatchFields().replace(Checked(X, Y), input=torch.zeros(2, 4))
