class ShelfError(Exception):
    """Base class of the errors this package raises."""


class NotOnShelf(ShelfError):
    """Every copy of the book is lent out."""


class LoanLimitReached(ShelfError):
    """The member already holds as many loans as allowed."""
