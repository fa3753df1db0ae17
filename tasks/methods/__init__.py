"""Index methods: what builds the hierarchy above layer 0, and which retrieval modes it offers.

``base`` says what a method is, ``registry`` which methods there are; ``hirag``, ``hygrag`` and ``archrag`` are
the built-in ones, ``common`` what they share.
"""
