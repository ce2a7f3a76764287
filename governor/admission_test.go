package governor

import "testing"

func TestAdmit(t *testing.T) {
	tests := []struct {
		ceiling, inFlight int
		want              bool
	}{
		{ceiling: 3, inFlight: 0, want: true},
		{ceiling: 3, inFlight: 2, want: true},
		{ceiling: 3, inFlight: 3, want: false},
		{ceiling: 3, inFlight: 1000, want: false},
		{ceiling: 0, inFlight: DefaultInFlightCeiling - 1, want: true}, // 0 means the default
		{ceiling: 0, inFlight: DefaultInFlightCeiling, want: false},
		{ceiling: -5, inFlight: DefaultInFlightCeiling - 1, want: true},
	}
	for _, tt := range tests {
		if got := NewAdmission(tt.ceiling).Admit(tt.inFlight); got != tt.want {
			t.Errorf("NewAdmission(%d).Admit(%d) = %v, want %v", tt.ceiling, tt.inFlight, got, tt.want)
		}
	}
}

func TestSetCeiling(t *testing.T) {
	a := NewAdmission(10)
	a.SetCeiling(2)
	if a.Ceiling() != 2 || a.Admit(2) {
		t.Errorf("after SetCeiling(2): Ceiling %d, Admit(2) %v; want 2, false", a.Ceiling(), a.Admit(2))
	}
	a.SetCeiling(0)
	if a.Ceiling() != DefaultInFlightCeiling {
		t.Errorf("SetCeiling(0) left Ceiling %d, want the default %d", a.Ceiling(), DefaultInFlightCeiling)
	}
}

func TestDefaultAdmissionIsShared(t *testing.T) {
	if DefaultAdmission() != DefaultAdmission() {
		t.Fatal("DefaultAdmission returned two gates; it must be process-wide")
	}
	if c := DefaultAdmission().Ceiling(); c != DefaultInFlightCeiling {
		t.Errorf("DefaultAdmission().Ceiling() = %d, want %d", c, DefaultInFlightCeiling)
	}
}
