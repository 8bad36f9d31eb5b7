"""The sweep page's form: which job to start from, what to sweep, and how to pick the best run."""

from __future__ import annotations

from typing import Any, cast

from django import forms

from webapp.jobs.models import TrainingJob
from webapp.sweeps.actions import SWEEPABLE
from webapp.sweeps.models import Goal, Kind


class SweepForm(forms.Form):
    base_job = forms.ModelChoiceField(queryset=TrainingJob.objects.none(), empty_label=None,
                                      help_text="Every run starts from this job's launch settings.")
    name = forms.CharField(max_length=80, widget=forms.TextInput(attrs={"placeholder": "lr sweep"}))
    kind = forms.ChoiceField(choices=Kind.choices, initial=Kind.GRID)
    space = forms.CharField(
        label="Fields to sweep", widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}),
        initial='{"learning_rate": [0.0001, 0.0003], "seed": [0, 1]}',
        help_text="A JSON object of the launch fields to sweep and their values. A random sweep also takes ranges: "
                  '{"learning_rate": {"min": 1e-5, "max": 1e-3, "log": true}}. Fields: ' + ", ".join(SWEEPABLE) + ".")
    count = forms.IntegerField(min_value=0, max_value=1000, initial=4, required=False,
                               help_text="Random: how many runs to draw.")
    seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0, required=False,
                              help_text="Random: the draws' seed (the same seed draws the same runs).")
    metric = forms.CharField(max_length=100, initial="eval/accuracy",
                             help_text="The metric the best run is chosen by (the group page can change it).")
    goal = forms.ChoiceField(choices=Goal.choices, initial=Goal.MAX)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base_job = cast("forms.ModelChoiceField[TrainingJob]", self.fields["base_job"])
        base_job.queryset = TrainingJob.objects.visible_to(user).order_by("-pk")
        base_job.label_from_instance = lambda j: f"#{j.pk} {j.name}"  # type: ignore[assignment]  # an instance attribute, as Django documents it

    def clean_space(self) -> dict[str, Any]:
        from webapp.inputs import loads

        try:
            value = loads(self.cleaned_data["space"])
        except ValueError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError('give a JSON object, e.g. {"learning_rate": [0.0001, 0.0003]}')
        return value
