"""Pairwise diversity of trained sub-models, measured on held-out data.

The partitioning paper reports that "pairwise diversity grows with the number
of partitions" without a definition we could check, so daskann measures two
plain, documented quantities over every pair ``(i, j)`` of sub-models:

* **representation diversity** ``1 - CKA(H_i, H_j)``, where ``H`` is the
  activation of a hidden layer on the evaluation data and CKA is linear
  centred kernel alignment (Kornblith et al. 2019):
  ``||H_j^T H_i||_F^2 / (||H_i^T H_i||_F ||H_j^T H_j||_F)`` on column-centred
  activations. It is 0 when one representation is a rotation and scaling of
  the other and grows towards 1 as they share less linear structure; it
  compares groups of different widths, which a unit-by-unit correlation
  cannot. Reported per hidden layer and averaged over layers and pairs.
* **prediction disagreement**: the share of samples on which the two
  sub-models predict different classes (argmax of the logits); for
  regression outputs, the mean over output columns of ``1 - |corr|`` between their
  outputs instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from daskann._validation import named_error
from daskann.nn import MLP, activate

DEFINITION = (
    "representation: mean over sub-model pairs and hidden layers of 1 - linear CKA of the hidden "
    "activations on validation data; disagreement: mean over pairs of the share of validation "
    "samples whose predicted class differs"
)


def hidden_activations(model: MLP, X) -> list[np.ndarray]:
    """Activations of every hidden layer on ``X``."""
    A = np.asarray(X, dtype=model.dtype)
    out = []
    for W, b in zip(model.weights[:-1], model.biases[:-1], strict=True):
        A = activate(A @ W + b, model.activation, model.negative_slope)
        out.append(A)
    return out


def linear_cka(A: np.ndarray, B: np.ndarray) -> float:
    """Linear centred kernel alignment of two representations of the same samples.

    Returns 1.0 when both are constant (nothing to tell apart), else a value in ``[0, 1]``.
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    A = A - A.mean(axis=0)
    B = B - B.mean(axis=0)
    cross = np.linalg.norm(B.T @ A) ** 2
    norms = np.linalg.norm(A.T @ A) * np.linalg.norm(B.T @ B)
    if norms == 0.0:
        return 1.0
    return float(min(max(cross / norms, 0.0), 1.0))


def submodel_diversity(submodels: Sequence[MLP], X, *, task: str = "classification") -> dict:
    """Pairwise diversity of ``submodels`` on the evaluation data ``X``.

    Parameters
    ----------
    submodels : sequence of MLP
        At least two networks with the same input and output widths.
    X : array-like of shape (n_samples, n_features)
        Evaluation data (the validation set).
    task : {"classification", "regression"}
        How predictions are compared.

    Returns
    -------
    dict
        JSON-safe: ``representation`` (mean 1 - CKA), ``disagreement``,
        ``pairs`` (one dict per pair with ``i``, ``j``, ``representation``
        per hidden layer and ``disagreement``), ``per_layer`` (mean over
        pairs), ``definition`` and ``n_samples``.
    """
    submodels = list(submodels)
    if len(submodels) < 2:
        raise named_error(
            ValueError, "submodels", f"{len(submodels)} networks is not valid: expected at least 2 to compare"
        )
    X = np.asarray(X)
    hidden = [hidden_activations(m, X) for m in submodels]
    outputs = [m.forward(X) for m in submodels]
    n_layers = min(len(h) for h in hidden)
    pairs = []
    for i, j in combinations(range(len(submodels)), 2):
        rep = [1.0 - linear_cka(hidden[i][layer], hidden[j][layer]) for layer in range(n_layers)]
        disagreement = _disagreement(outputs[i], outputs[j], task)
        pairs.append({"i": i, "j": j, "representation": rep, "disagreement": disagreement})
    per_layer = [float(np.mean([p["representation"][layer] for p in pairs])) for layer in range(n_layers)]
    return {
        "representation": float(np.mean(per_layer)) if per_layer else float("nan"),
        "disagreement": float(np.mean([p["disagreement"] for p in pairs])),
        "per_layer": per_layer,
        "pairs": pairs,
        "definition": DEFINITION,
        "n_samples": int(X.shape[0]),
    }


def _disagreement(a: np.ndarray, b: np.ndarray, task: str) -> float:
    if task == "classification":
        return float(np.mean(np.argmax(a, axis=1) != np.argmax(b, axis=1)))
    values = []
    for col in range(a.shape[1]):
        if np.std(a[:, col]) == 0 or np.std(b[:, col]) == 0:
            values.append(1.0)
            continue
        values.append(1.0 - abs(float(np.corrcoef(a[:, col], b[:, col])[0, 1])))
    return float(np.mean(values))
