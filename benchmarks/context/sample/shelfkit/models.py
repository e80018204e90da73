from dataclasses import dataclass, field
from datetime import date


@dataclass
class Book:
    """A title the library owns, with how many copies are on the shelf."""
    isbn: str
    title: str
    copies: int = 1
    tags: list[str] = field(default_factory=list)


@dataclass
class Member:
    """Someone who may borrow books."""
    member_id: int
    name: str
    max_loans: int = 3


@dataclass
class Loan:
    """One copy of a book lent to a member until `due`."""
    isbn: str
    member_id: int
    due: date
    returned: bool = False


def overdue(loan: Loan, today: date) -> bool:
    """True when the loan is still out after its due date."""
    return not loan.returned and loan.due < today
