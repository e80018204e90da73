from .errors import NotOnShelf
from .models import Book, Loan, Member


class Catalog:
    """Books and members by key, with the loans currently out."""

    def __init__(self) -> None:
        self.books: dict[str, Book] = {}
        self.members: dict[int, Member] = {}
        self.loans: list[Loan] = []

    def add_book(self, book: Book) -> None:
        """Adds a title, or more copies of one already held."""
        held = self.books.get(book.isbn)
        if held is None:
            self.books[book.isbn] = book
        else:
            held.copies += book.copies

    def available(self, isbn: str) -> int:
        """Copies of `isbn` on the shelf now."""
        out = sum(1 for loan in self.loans if loan.isbn == isbn and not loan.returned)
        return self.books[isbn].copies - out

    def loans_of(self, member_id: int) -> list[Loan]:
        """The loans a member has not returned yet."""
        return [loan for loan in self.loans if loan.member_id == member_id and not loan.returned]

    def take_copy(self, isbn: str) -> Book:
        """The book, when a copy is on the shelf."""
        if self.available(isbn) <= 0:
            raise NotOnShelf(isbn)
        return self.books[isbn]
