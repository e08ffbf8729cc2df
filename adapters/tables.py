"""A user-style adapter: the wine table from scikit-learn as an indexed dataset of dict samples.

Referenced from config as ``factory: "adapters.tables:wine_table"``; betonbuild imports it with the
working directory on sys.path and maps dict samples onto fields by name.
"""

import numpy as np


class WineTable:
    def __init__(self, features, labels, class_names, feature_names):
        self.features = np.ascontiguousarray(features, dtype=np.float32)
        self.labels = labels
        self.class_names = list(class_names)
        self.feature_names = list(feature_names)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        label = int(self.labels[index])
        return {
            "features": self.features[index],
            "label": label,
            "class_name": str(self.class_names[label]),  # a str for the custom fixed-width UTF-8 field
            "meta": {"row": int(index), "class_name": str(self.class_names[label]), "source": "sklearn load_wine"},
        }


def wine_table(scale: float = 1.0):
    from sklearn.datasets import load_wine

    wine = load_wine()
    return WineTable(wine.data * scale, wine.target, wine.target_names, wine.feature_names)
