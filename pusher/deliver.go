package pusher

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/storage"
)

// NotifyPath is the push gateway API's path every pusher's URL has.
const NotifyPath = "/_matrix/push/v1/notify"

type workerKey struct{ userID, appID, pushkey string }

// worker delivers one pusher's notifications in order.
type worker struct {
	key     workerKey
	queue   []*request
	running bool
}

// request is one notification for one pusher, as sent.
type request struct {
	url  string
	body []byte
	// eventID names it in logs.
	eventID string
}

// deliver queues the batch's notifications for the pushers of their
// users, with each user's unread count as the badge.
func (s *Service) deliver(ctx context.Context, upTo storage.StreamPos, pushes []push) {
	pushers := map[string][]storage.Pusher{}
	badges := map[string]int{}
	for _, p := range pushes {
		list, ok := pushers[p.userID]
		if !ok {
			var err error
			if list, err = s.db.Pushers(ctx, p.userID); err != nil {
				s.o.Logger.WithError(err).WithField("user_id", p.userID).Warn("push: reading pushers failed")
			}
			pushers[p.userID] = list
			if len(list) > 0 {
				// The badge: the rooms with unread notifications, as
				// Synapse counts by default.
				counts, err := s.db.UnreadCounts(ctx, p.userID, upTo)
				if err != nil {
					s.o.Logger.WithError(err).WithField("user_id", p.userID).Warn("push: reading unread counts failed")
				}
				badges[p.userID] = len(counts)
			}
		}
		for _, pu := range list {
			if pu.Kind != "http" {
				continue
			}
			var data map[string]any
			if json.Unmarshal(pu.Data, &data) != nil {
				continue
			}
			url, _ := data["url"].(string)
			body, err := json.Marshal(map[string]any{"notification": notification(p, pu, data, badges[p.userID])})
			if err != nil || url == "" {
				continue
			}
			s.enqueue(workerKey{pu.UserID, pu.AppID, pu.Pushkey}, &request{url: url, body: body, eventID: p.event.EventID})
		}
	}
}

// notification is the body's notification for one pusher: the event's
// IDs only when the pusher's format is event_id_only, else with the
// event's type, sender and content.
func notification(p push, pu storage.Pusher, data map[string]any, badge int) map[string]any {
	prio := "low"
	if p.fields["type"] == "m.room.encrypted" || p.outcome.Highlight || p.outcome.Tweaks["sound"] != nil {
		prio = "high"
	}
	tweaks := map[string]any{}
	for k, v := range p.outcome.Tweaks {
		if k == "highlight" && v != true {
			continue // the gateway takes an absent highlight as false
		}
		tweaks[k] = v
	}
	deviceData := map[string]any{}
	for k, v := range data {
		if k != "url" {
			deviceData[k] = v
		}
	}
	n := map[string]any{
		"event_id": p.event.EventID,
		"room_id":  p.event.RoomID,
		"counts":   map[string]any{"unread": badge},
		"prio":     prio,
		"devices": []any{map[string]any{
			"app_id":     pu.AppID,
			"pushkey":    pu.Pushkey,
			"pushkey_ts": pu.PushkeyTS / 1000,
			"data":       deviceData,
			"tweaks":     tweaks,
		}},
	}
	if data["format"] == "event_id_only" {
		return n
	}
	n["type"] = p.fields["type"]
	n["sender"] = p.event.Sender
	if p.senderName != "" {
		n["sender_display_name"] = p.senderName
	}
	if c, ok := p.fields["content"].(map[string]any); ok && len(c) > 0 {
		n["content"] = c
	}
	if p.fields["type"] == "m.room.member" {
		if key, ok := p.fields["state_key"].(string); ok {
			c, _ := p.fields["content"].(map[string]any)
			n["membership"] = c["membership"]
			n["user_is_target"] = key == p.userID
		}
	}
	return n
}

func (s *Service) enqueue(key workerKey, r *request) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.stop.Err() != nil {
		return
	}
	w := s.workers[key]
	if w == nil {
		w = &worker{key: key}
		s.workers[key] = w
	}
	if len(w.queue) >= s.o.QueueLength {
		w.queue = w.queue[1:]
	}
	w.queue = append(w.queue, r)
	if !w.running {
		w.running = true
		s.wg.Add(1)
		go s.run(w)
	}
}

// next returns the worker's next request; nil when its queue is empty
// (the worker is then gone).
func (s *Service) next(w *worker) *request {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if len(w.queue) == 0 || s.stop.Err() != nil {
		w.running = false
		delete(s.workers, w.key)
		return nil
	}
	return w.queue[0]
}

// pop removes r, done with, from the head of the queue (unless the
// queue dropped it meanwhile), or every request when drop is set.
func (s *Service) pop(w *worker, r *request, drop bool) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if drop {
		w.queue = nil
	} else if len(w.queue) > 0 && w.queue[0] == r {
		w.queue = w.queue[1:]
	}
}

// run delivers a pusher's queue in order. A failure waits and tries the
// same notification again, each wait twice the last; once the wait would
// pass MaxBackoff that notification is given up. A gateway that answers
// the pushkey is rejected has the pusher removed, as Synapse does.
func (s *Service) run(w *worker) {
	defer s.wg.Done()
	backoff := s.o.MinBackoff
	log := s.o.Logger.WithFields(logrus.Fields{"user_id": w.key.userID, "app_id": w.key.appID})
	for {
		r := s.next(w)
		if r == nil {
			return
		}
		rejected, err := s.send(r, w.key.pushkey)
		switch {
		case err == nil && rejected:
			log.Info("push: the gateway rejected the pushkey; the pusher is removed")
			if err := s.db.DeletePusher(s.stop, w.key.userID, w.key.appID, w.key.pushkey); err != nil && s.stop.Err() == nil {
				log.WithError(err).Warn("push: removing a rejected pusher failed")
			}
			s.pop(w, r, true)
		case err == nil:
			s.pop(w, r, false)
			backoff = s.o.MinBackoff
		case backoff > s.o.MaxBackoff:
			log.WithError(err).WithField("event_id", r.eventID).Warn("push: giving up a notification")
			s.pop(w, r, false)
			backoff = s.o.MinBackoff
		default:
			log.WithError(err).WithFields(logrus.Fields{"event_id": r.eventID, "retry_in": backoff}).Info("push: delivery failed")
			t := time.NewTimer(backoff)
			select {
			case <-s.stop.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff *= 2
		}
	}
}

// send posts one notification; rejected reports that the gateway named
// the pushkey in its answer's rejected list.
func (s *Service) send(r *request, pushkey string) (rejected bool, err error) {
	req, err := http.NewRequestWithContext(s.stop, http.MethodPost, r.url, bytes.NewReader(r.body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return false, fmt.Errorf("gateway answered %d", resp.StatusCode)
	}
	var answer struct {
		Rejected []string `json:"rejected"`
	}
	_ = json.Unmarshal(raw, &answer)
	return slices.Contains(answer.Rejected, pushkey), nil
}
